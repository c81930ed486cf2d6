"""h3bench's own kernels. Import the public functions from here."""
