"""Cost models: fill CostTables from a graph, a cluster and the configs of each node."""
