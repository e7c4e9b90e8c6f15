"""The built-in evaluators, one module per family; `evaluation.registry.EVALUATORS` lists them by name."""
