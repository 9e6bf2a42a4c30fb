"""Operator tools: the leasectl command line, status, checkpoint reset, the configuration reference."""
