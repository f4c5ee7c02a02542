"""Searches: read CostTables, return a Solution. No search imports a cost model."""
