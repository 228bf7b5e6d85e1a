"""The node daemon's rooms: the server on the socket (server), the daemon that holds them
together (daemon), the snapshot of the dataset (snapshot, pfsmeta), the stager that copies
files from their sources (stager, sources, concurrency) into the tiers (tiers, codecs,
resources)."""
