"""Constants the benchmarks share (no imports: paired.py chooses which mbbatch a process imports first)."""

#: the token policies' and cluster engines' D_SLA, s/token: the parameter table's default when these
#: benchmarks were first taken (7.5 ms; 7.4 ms since), kept so that their scenarios, their load and
#: their figures stay comparable from stop to stop, and so that paired.py's two versions run the same
#: simulation
D_SLA = 7.5e-3
