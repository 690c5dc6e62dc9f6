"""The separable-architecture (SNA) family: SAC on HalfCheetah, Lorenz forecasting and the separable-attention LM."""
