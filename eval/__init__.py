"""Evaluation harness and benchmarks for the ArborMem runtime."""
