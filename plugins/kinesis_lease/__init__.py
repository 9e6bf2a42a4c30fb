"""The Airflow side of kinesis-lease-batch: round operators, the AWS connection, the monitoring UI."""
