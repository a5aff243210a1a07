// Command cert-manager-webhook validates and mutates cert-manager resources, with
// internal/webhook of the pinned github.com/cert-manager/cert-manager module (this
// module's path lies under github.com/cert-manager/cert-manager, as upstream's own
// nested cmd/webhook module does, which the Go module proxy does not serve). Its
// serving certificate is dynamic: a CA kept in a Secret that cainjector copies into
// the webhook configurations, as in a cluster.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cert-manager/cert-manager/internal/apis/config/shared"
	config "github.com/cert-manager/cert-manager/internal/apis/config/webhook"
	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
)

func main() {
	// Its own flag set: controller-runtime registers --kubeconfig on the global one.
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster")
	port := fs.Int("secure-port", 0, "HTTPS port of the admission endpoints")
	healthz := fs.Int("healthz-port", 0, "HTTP port of /healthz and /livez")
	namespace := fs.String("namespace", "cert-manager", "namespace of the serving CA Secret")
	secret := fs.String("ca-secret", "cert-manager-webhook-ca", "name of the serving CA Secret")
	dnsNames := fs.String("dns-names", "cert-manager-webhook,cert-manager-webhook.cert-manager,cert-manager-webhook.cert-manager.svc", "serving certificate DNS names")
	_ = fs.Parse(os.Args[1:])
	if *kubeconfig == "" || *port == 0 || *healthz == 0 {
		fmt.Fprintln(os.Stderr, "cert-manager-webhook: --kubeconfig, --secure-port and --healthz-port are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := logf.Log.WithName("webhook")
	ctx = logf.NewContext(ctx, log)
	opts := config.WebhookConfiguration{
		SecurePort:           int32(*port),
		HealthzPort:          int32(*healthz),
		KubeConfig:           *kubeconfig,
		MetricsListenAddress: "0",
		TLSConfig: shared.TLSConfig{
			MinTLSVersion: "VersionTLS12",
			Dynamic: shared.DynamicServingConfig{
				SecretNamespace: *namespace,
				SecretName:      *secret,
				DNSNames:        strings.Split(*dnsNames, ","),
				LeafDuration:    7 * 24 * time.Hour,
			},
		},
	}
	srv, err := cmwebhook.NewCertManagerWebhookServer(log, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-webhook: %v\n", err)
		os.Exit(1)
	}
	if err := srv.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-webhook: %v\n", err)
		os.Exit(1)
	}
}
