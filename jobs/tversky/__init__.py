"""The Tversky family: the XOR, image and language-model tasks, their data and summaries."""
