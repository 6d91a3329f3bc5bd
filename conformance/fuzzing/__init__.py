"""Drawn cases judged live against the spec: draws, shrinking, repro folders (the localisation: cases/localise.py)."""
