"""Privacy attacks run from what a party observed on the wire (label inference, Fu et al.)."""
