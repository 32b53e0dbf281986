"""Privacy: pure analysis (analysis/), accountants, and attacks."""
