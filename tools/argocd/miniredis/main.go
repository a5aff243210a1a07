// Command miniredis serves github.com/alicebob/miniredis/v2 (an in-memory Redis that
// Argo CD's own module graph already holds, for its tests) on a loopback port: the
// cache Argo CD's repo-server and application-controller share, for the local
// control plane, where no redis-server is installed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/alicebob/miniredis/v2"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "listen address")
	flag.Parse()
	srv := miniredis.NewMiniRedis()
	if err := srv.StartAddr(*addr); err != nil {
		fmt.Fprintf(os.Stderr, "miniredis: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("miniredis listening on %s\n", srv.Addr())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	srv.Close()
}
