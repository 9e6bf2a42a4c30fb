"""The consumer's configuration: KCL's settings, their defaults and checks, and where values come from."""
