"""The mutation battery: the spec's mutants and the planted kernel bugs."""
