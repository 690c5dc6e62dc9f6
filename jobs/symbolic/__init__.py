"""The symbol-invariant transformer family: propositional logic and LTL, their data, checkers, loop and summaries."""
