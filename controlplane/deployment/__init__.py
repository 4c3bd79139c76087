"""One deployment inside a shard: its conductor and the owners it composes."""
