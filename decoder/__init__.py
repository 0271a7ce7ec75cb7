"""specls.decoder: the speculative decode loop, drafters, acceptance and stats. Pure: no ORT, no torch."""
