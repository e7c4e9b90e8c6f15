"""Experiment drivers: one module per paper study (see gin_configs/experiments/)."""
