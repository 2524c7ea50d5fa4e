"""`forge-bridge inspect`: a local web app over a run folder -- curves, trajectories, tokens,
credit, groups and adapter versions (see `server.Inspector`)."""
