"""The built-in decoders, one module each, chosen by name (`spark_jobs.decode.BUILT_IN_DECODERS`)."""
