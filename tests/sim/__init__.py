"""The seeded whole-system simulator (`make sim`) and the SIGKILL torture (`make torture`)."""
