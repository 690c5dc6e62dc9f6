"""Torch modules for the primitives we study. Import them from their own files."""
