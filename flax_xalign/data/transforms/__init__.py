"""Transforms of text and ids: synthetic languages, syntax reordering, code switching, dictionaries."""
