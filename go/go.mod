module stepgraph.dev/stepgraph

// Debian 12's golang-go. No dependencies beyond the standard library: nothing but Debian
// and PyPI is reachable from the build machines.
go 1.19
