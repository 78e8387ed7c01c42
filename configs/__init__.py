"""Packaged run configs (YAML), installed as draftsmith.configs; read them with importlib.resources."""
