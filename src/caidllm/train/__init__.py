"""Training the embedded tiny model: masked diffusion SFT on the synthetic tasks."""
