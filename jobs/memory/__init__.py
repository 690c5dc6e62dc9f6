"""The key-value memory family: capacity, Hopfield retrieval and knowledge neurons."""
