"""The project's own tests, one folder per part of the project; test_imports.py checks the import graph of the whole."""
