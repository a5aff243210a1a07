// Command registry is the CNCF distribution registry (github.com/distribution/distribution/v3)
// with only the storage drivers the tests use: the filesystem and in-memory ones. Upstream's
// cmd/registry also links the Azure, GCS and S3 drivers, which tools/provision.sh would spend
// minutes building for nothing here. The program itself (its config file, its HTTP API, its
// `serve` and `garbage-collect` commands) is upstream's registry.RootCmd, unchanged.
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	// RootCmd exits non-zero itself when a command fails (as upstream's main relies on).
	_ = registry.RootCmd.Execute()
}
