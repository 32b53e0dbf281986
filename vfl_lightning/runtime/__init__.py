"""Where the parties run: the party interface and its local and Ray implementations."""
