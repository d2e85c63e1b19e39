// The schema registry of the local stack and of the tests: AxonOps Schema Registry, a server of Confluent's
// Schema Registry REST API (Apache-2.0), built from the Go module proxy by `bergstream local
// build-schema-registry`. Its version is pinned here, and go.sum pins the hashes of it and of its modules.
module bergstream.local/schema-registry

go 1.26.0

require github.com/axonops/axonops-schema-registry v0.2.1
