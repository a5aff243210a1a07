// Command coredns is CoreDNS with only the plugins the local control plane's cluster DNS
// uses (bind, errors, health, kubernetes, cache): the full plugin set pulls in every cloud
// SDK and triples the build. localcluster/node.py runs it on the real node's bridge address
// as the pods' nameserver (kubelet clusterDNS), so Service names resolve as in any cluster.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
