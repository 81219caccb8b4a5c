"""The TC grammar, installed as the package data `tcpy.grammar` (see pyproject.toml)."""
