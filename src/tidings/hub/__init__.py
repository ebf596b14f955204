"""Hub use cases: accounts, tokens, channels and posting, each over the store."""
