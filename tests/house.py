"""The project's top folders, named once for the tests that walk the whole house."""

#: The project's code, package by package.
PACKAGES = (
    "canary",
    "canary_torch",
    "reference",
    "engine_model",
    "strategies",
    "conformance",
    "strength",
    "tools",
    "benchmarks",
    "examples",
)

#: Every top folder of the project's own text: its code, its tests, scripts, docs and CI.
FOLDERS = (*PACKAGES, "tests", "scripts", "docs", ".ci", ".github")
