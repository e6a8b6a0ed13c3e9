"""Trainers: the pieces a training script assembles (data split, evaluation, logging, DDP helpers)."""
