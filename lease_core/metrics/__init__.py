"""What slots report for the next assignment: worker utilization (WorkerMetricStats) and lease throughput."""
