// Command dashboard-check validates Grafana dashboard JSON files against Grafana's dashboard
// schema, as the Grafana foundation SDK's generated Go types hold it: each file is decoded with
// the strict decoder (a missing required field, a mistyped one or an unknown one fails; panel
// options, field config and Prometheus queries are decoded by their plugin's own types), then
// Validate() checks the constraints the schema states. It prints one line per problem and exits
// 1 when any file fails, 2 when a file cannot be read.
//
// Usage: dashboard-check FILE...
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dashboard-check FILE...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	status := 0
	for _, path := range os.Args[1:] {
		raw, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(2)
		}
		var board dashboard.Dashboard
		if err := board.UnmarshalJSONStrict(raw); failed(err) {
			fmt.Printf("%s: FAILED: %v\n", path, err)
			status = 1
			continue
		}
		if err := board.Validate(); failed(err) {
			fmt.Printf("%s: FAILED: %v\n", path, err)
			status = 1
			continue
		}
		fmt.Printf("%s: SUCCESS: %d panels, schemaVersion %d\n", path, len(board.Panels), board.SchemaVersion)
	}
	os.Exit(status)
}

// failed: the decoder returns its list of problems as an error even when the list is empty.
func failed(err error) bool {
	if err == nil {
		return false
	}
	var problems cog.BuildErrors
	if errors.As(err, &problems) {
		return len(problems) > 0
	}
	return true
}
