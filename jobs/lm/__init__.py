"""Shared by every GPT language-model task (tversky.lm, sna.lm, memory.neurons): config, data and the loop."""
