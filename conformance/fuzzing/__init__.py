"""Drawn cases judged live against the spec: draws, shrinking, localisation, repro folders."""
