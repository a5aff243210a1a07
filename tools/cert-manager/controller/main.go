// Command cert-manager-controller runs the cert-manager controllers that the
// gpu-scheduler charts use (Issuers, ClusterIssuers, Certificates, the SelfSigned
// and CA CertificateRequest issuers and the approver) from the packages of the
// pinned github.com/cert-manager/cert-manager module. Upstream's own entry point
// (cmd/controller) is a nested module the Go module proxy does not serve, so
// tools/provision.sh builds this one instead: one process, no leader election,
// for the local control plane only.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
)

func main() {
	// Its own flag set: controller-runtime registers --kubeconfig on the global one.
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster to manage")
	clusterNS := fs.String("cluster-resource-namespace", "cert-manager", "namespace of ClusterIssuer Secrets")
	workers := fs.Int("workers", 2, "workers per controller")
	_ = fs.Parse(os.Args[1:])
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "cert-manager-controller: --kubeconfig is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")

	opts := controllerpkg.ContextOptions{
		Kubeconfig:         *kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      controllerpkg.IssuerOptions{ClusterResourceNamespace: *clusterNS},
		CertificateOptions: controllerpkg.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Minute,
			CertificateRequestMaximumBackoffDuration: 5 * time.Minute,
		},
	}
	factory, err := controllerpkg.NewContextFactory(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-controller: %v\n", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(controllerpkg.Known()))
	for name := range controllerpkg.Known() {
		names = append(names, name)
	}
	sort.Strings(names)
	controllers := make(map[string]controllerpkg.Interface, len(names))
	for _, name := range names {
		c, err := controllerpkg.Known()[name](factory)
		if err != nil {
			fmt.Fprintf(os.Stderr, "cert-manager-controller: %s: %v\n", name, err)
			os.Exit(1)
		}
		controllers[name] = c
	}
	// The controllers registered their informers while being built; start them now.
	shared, err := factory.Build()
	if err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-controller: %v\n", err)
		os.Exit(1)
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	logf.Log.Info("starting controllers", "controllers", names)

	var wg sync.WaitGroup
	for name, c := range controllers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(*workers, ctx); err != nil {
				logf.Log.Error(err, "controller stopped", "controller", name)
				stop()
			}
		}()
	}
	wg.Wait()
}
