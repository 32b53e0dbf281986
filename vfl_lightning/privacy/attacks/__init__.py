"""Privacy attacks run by a role (server, passive party, eavesdropper) from what it observed on the
wire: feature reconstruction, norm / direction scoring, model completion, label inference, collusion."""
