"""The controller side of push health (seed 000): the registry of pushed results, the
probe gate, the stall guard and the figures they count."""
