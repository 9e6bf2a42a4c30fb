"""A local trial of the project, outside any checkout: `kinesis-lease local up|status|env|create-stream|down`
starts AWS emulators on loopback in the background (`emulators`, `trial`) and prints the environment
that points boto3, Airflow and Spark at them (`environment`). Needs the `local` extra (moto's server)."""
