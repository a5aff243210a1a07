{{/*
Name of the chart, overridable with nameOverride.
*/}}
{{- define "gpu-scheduler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name: "<release>-<chart>", or the release name when it already
contains the chart name. Truncated to 63 characters (DNS label).
The webhook Service adds "-webhook", so keep releases under ~55 characters.
*/}}
{{- define "gpu-scheduler.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value: name-version.
*/}}
{{- define "gpu-scheduler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: only name and instance, never anything that changes on upgrade.
*/}}
{{- define "gpu-scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "gpu-scheduler.labels" -}}
helm.sh/chart: {{ include "gpu-scheduler.chart" . }}
{{ include "gpu-scheduler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-scheduler
{{- end }}

{{/*
Labels of the scheduler's objects (pods included): the common labels and the component.
*/}}
{{- define "gpu-scheduler.schedulerLabels" -}}
{{ include "gpu-scheduler.labels" . }}
app.kubernetes.io/component: scheduler
{{- end }}

{{/*
Selector labels of the webhook pods. Their app.kubernetes.io/name is "<name>-webhook",
so the scheduler's selector (name + instance, immutable in its Deployment) never
matches a webhook pod, and this selector never matches a scheduler pod.
*/}}
{{- define "gpu-scheduler.webhookSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-webhook" (include "gpu-scheduler.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{/*
Labels of the webhook Deployment and its pods.
*/}}
{{- define "gpu-scheduler.webhookPodLabels" -}}
helm.sh/chart: {{ include "gpu-scheduler.chart" . }}
{{ include "gpu-scheduler.webhookSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-scheduler
{{- end }}

{{/*
Labels of the webhook's other objects (Service, ServiceAccount, RBAC, configurations,
certificates): the common labels and the component.
*/}}
{{- define "gpu-scheduler.webhookLabels" -}}
{{ include "gpu-scheduler.labels" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{/*
Selector labels of the helm test pods: their own app.kubernetes.io/name "<name>-test",
so that no selector of the release (the scheduler's Service, PodDisruptionBudget and
NetworkPolicy) ever picks a test pod, and the tests' NetworkPolicy picks nothing else.
*/}}
{{- define "gpu-scheduler.testSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-test" (include "gpu-scheduler.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end }}

{{/*
Labels of the helm test objects.
*/}}
{{- define "gpu-scheduler.testLabels" -}}
helm.sh/chart: {{ include "gpu-scheduler.chart" . }}
{{ include "gpu-scheduler.testSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-scheduler
{{- end }}

{{/*
URL the health test checks: tests.schedulerUrl, else the health Service when the
scheduler runs in the cluster, else nothing (no health test pod).
*/}}
{{- define "gpu-scheduler.testSchedulerUrl" -}}
{{- if .Values.tests.schedulerUrl }}
{{- .Values.tests.schedulerUrl }}
{{- else if gt (int .Values.replicaCount) 0 }}
{{- printf "http://%s.%s.svc:%v/healthz" (include "gpu-scheduler.fullname" .) .Release.Namespace .Values.service.port }}
{{- end }}
{{- end }}

{{/*
ServiceAccount of the scheduler.
*/}}
{{- define "gpu-scheduler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-scheduler.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
ServiceAccount of the webhook (its own: it may list and watch nodes, nothing else).
*/}}
{{- define "gpu-scheduler.webhookServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-scheduler.webhookName" .) .Values.webhook.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.webhook.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The username the apiserver gives the scheduler's ServiceAccount token.
*/}}
{{- define "gpu-scheduler.schedulerUsername" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpu-scheduler.serviceAccountName" .) }}
{{- end }}

{{/*
An image reference, REPOSITORY@DIGEST when a digest is given, else REPOSITORY:TAG, with the
registry a mirror gives: global.imageRegistry (a parent chart's, or --set global.imageRegistry)
over the chart-local registry (image.registry, extender.kubeScheduler.image.registry) over
the one the repository names. Either replaces the repository's registry, its first component
when that has a "." or a ":" or is "localhost" (Docker's rule), and keeps its path:
mirror.example:5000 + registry.k8s.io/kube-scheduler = mirror.example:5000/kube-scheduler.
Call: include "gpu-scheduler.imageRef" (dict "root" $ "registry" R "repository" P "tag" T "digest" D)
*/}}
{{- define "gpu-scheduler.imageRef" -}}
{{- $registry := ((.root.Values.global).imageRegistry) | default .registry | default "" }}
{{- $repository := .repository }}
{{- if $registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) (regexReplaceAll "^([^/]*[.:][^/]*|localhost)/" $repository "") }}
{{- end }}
{{- if .digest }}
{{- printf "%s@%s" $repository .digest }}
{{- else }}
{{- printf "%s:%s" $repository .tag }}
{{- end }}
{{- end }}

{{/*
Container image: repository@digest when image.digest is set (a release's packaged chart
pins the digest it pushed), else repository:tag (tag default: the chart's appVersion); the
registry as "gpu-scheduler.imageRef" says.
*/}}
{{- define "gpu-scheduler.image" -}}
{{- include "gpu-scheduler.imageRef" (dict "root" . "registry" .Values.image.registry "repository" .Values.image.repository "tag" (default .Chart.AppVersion .Values.image.tag) "digest" .Values.image.digest) }}
{{- end }}

{{/*
"true" when this release renders the GPUPinningPolicy CRD: crds.install, and the CRD is not
already in the cluster under another owner (another release, or kubectl). Helm refuses to
install an object another release owns, so the second release of a cluster leaves the CRD to
the first. `helm template` and client-side dry runs see no cluster: they render it.
*/}}
{{- define "gpu-scheduler.installCrd" -}}
{{- if .Values.crds.install }}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "gpupinningpolicies.gpu-scheduler.io" }}
{{- $annotations := (($crd).metadata).annotations | default dict }}
{{- if or (not $crd) (and (eq (get $annotations "meta.helm.sh/release-name") .Release.Name) (eq (get $annotations "meta.helm.sh/release-namespace") .Release.Namespace)) }}true{{- end }}
{{- end }}
{{- end }}

{{/*
Where a pod goes and what it pulls with: shared by every pod of the chart.

imagePullSecrets: global.imagePullSecrets (a parent chart's, when this chart is a subchart;
names or {name} objects) then imagePullSecrets, without duplicates.
*/}}
{{- define "gpu-scheduler.imagePullSecrets" -}}
{{- $secrets := list }}
{{- range concat (((.Values.global).imagePullSecrets) | default list) (.Values.imagePullSecrets | default list) }}
{{- $secret := ternary (dict "name" .) . (kindIs "string" .) }}
{{- if not (has $secret $secrets) }}
{{- $secrets = append $secrets $secret }}
{{- end }}
{{- end }}
{{- with $secrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
affinity: the given one (`affinity`), plus a preferred node affinity for control-plane nodes
(preferControlPlane) unless it has a nodeAffinity of its own, plus, when no affinity was
given and `spread` holds selector labels, a preferred pod anti-affinity on the hostname.
Call: include "gpu-scheduler.affinity" (dict "root" . "affinity" .Values.affinity "spread" $labels)
*/}}
{{- define "gpu-scheduler.affinity" -}}
{{- $affinity := deepCopy (.affinity | default dict) }}
{{- if and .root.Values.preferControlPlane (not (hasKey $affinity "nodeAffinity")) }}
{{- $term := dict "key" "node-role.kubernetes.io/control-plane" "operator" "Exists" }}
{{- $_ := set $affinity "nodeAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "preference" (dict "matchExpressions" (list $term))))) }}
{{- end }}
{{- if and (not .affinity) .spread }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" .spread) }}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
topologySpreadConstraints: each given constraint, with the pods' selector labels as its
labelSelector when it names none (as cert-manager's chart does).
Call: include "gpu-scheduler.topologySpread" (dict "constraints" .Values.topologySpreadConstraints "selector" $labels)
*/}}
{{- define "gpu-scheduler.topologySpread" -}}
{{- $constraints := list }}
{{- range .constraints }}
{{- if hasKey . "labelSelector" }}
{{- $constraints = append $constraints . }}
{{- else }}
{{- $constraints = append $constraints (merge (dict "labelSelector" (dict "matchLabels" (deepCopy $.selector))) (deepCopy .)) }}
{{- end }}
{{- end }}
{{- with $constraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Leader-election Lease name.
*/}}
{{- define "gpu-scheduler.leaseName" -}}
{{- default (include "gpu-scheduler.fullname" .) .Values.scheduler.leaderElection.leaseName }}
{{- end }}

{{/*
Webhook names.
*/}}
{{- define "gpu-scheduler.webhookName" -}}
{{- printf "%s-webhook" (include "gpu-scheduler.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-scheduler.webhookServiceName" -}}
{{- include "gpu-scheduler.webhookName" . }}
{{- end }}

{{- define "gpu-scheduler.webhookSecretName" -}}
{{- default (printf "%s-tls" (include "gpu-scheduler.webhookName" .)) .Values.webhook.existingSecret }}
{{- end }}

{{/*
True ("true") when the webhook runs in the cluster, behind the chart's Service:
webhook.enabled and no webhook.url.
*/}}
{{- define "gpu-scheduler.webhookInCluster" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.url) }}true{{- end }}
{{- end }}

{{/*
Name of the serving Certificate (cert-manager), used by inject-ca-from.
*/}}
{{- define "gpu-scheduler.servingCertName" -}}
{{- printf "%s-serving" (include "gpu-scheduler.webhookName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Annotations of the webhook configurations: cert-manager's CA injector.
*/}}
{{- define "gpu-scheduler.webhookAnnotations" -}}
{{- if and .Values.webhook.certManager.enabled (not .Values.webhook.url) }}
cert-manager.io/inject-ca-from: {{ printf "%s/%s" .Release.Namespace (include "gpu-scheduler.servingCertName" .) }}
{{- end }}
{{- end }}

{{/*
clientConfig of a webhook; argument: dict "ctx" $ "path" "/mutate".
*/}}
{{- define "gpu-scheduler.clientConfig" -}}
{{- $ := .ctx }}
{{- if $.Values.webhook.url }}
url: {{ printf "%s%s" (trimSuffix "/" $.Values.webhook.url) .path | quote }}
{{- else }}
service:
  name: {{ include "gpu-scheduler.webhookServiceName" $ }}
  namespace: {{ $.Release.Namespace }}
  path: {{ .path | quote }}
  port: 443
{{- end }}
{{- if not (and $.Values.webhook.certManager.enabled (not $.Values.webhook.url)) }}
caBundle: {{ $.Values.webhook.caBundle | quote }}
{{- end }}
{{- end }}

{{/*
"true" when the cluster serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy
(Kubernetes >= 1.36), as helm's capabilities say: discovery for `helm install/upgrade`,
`--api-versions` for `helm template` (Argo CD passes the destination cluster's).
*/}}
{{- define "gpu-scheduler.servesMutatingPolicy" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}true{{- end }}
{{- end }}

{{/*
The injection mode in effect, `webhook` or `policy`: injection.mode when it names one;
for `auto`, policy where the cluster serves MutatingAdmissionPolicy v1 and webhook.enabled
is not true (an installation that enabled the webhook keeps it on upgrade), else webhook.
*/}}
{{- define "gpu-scheduler.injectionMode" -}}
{{- if eq (toString .Values.injection.mode) "auto" }}
{{- if and (include "gpu-scheduler.servesMutatingPolicy" .) (not .Values.webhook.enabled) }}policy{{ else }}webhook{{ end }}
{{- else }}
{{- .Values.injection.mode }}
{{- end }}
{{- end }}

{{/*
The injection settings of both modes: injection.*, unless the deprecated webhook.* name
is set (webhook.injectionMode, webhook.gpuResourcePolicy, webhook.excludeNamespaces,
webhook.namespaceSelector: null by default), which then wins.
*/}}
{{- define "gpu-scheduler.deviceMode" -}}
{{- .Values.webhook.injectionMode | default .Values.injection.deviceMode }}
{{- end }}

{{/*
nvidia-cdi device mode: the RuntimeClass a mapped pod gets (injection.runtimeClassName; empty
in the other device modes, and when set empty: none given).
*/}}
{{- define "gpu-scheduler.runtimeClassName" -}}
{{- if eq (include "gpu-scheduler.deviceMode" .) "nvidia-cdi" }}{{ .Values.injection.runtimeClassName | default "" }}{{ end }}
{{- end }}

{{- define "gpu-scheduler.gpuResourcePolicy" -}}
{{- .Values.webhook.gpuResourcePolicy | default .Values.injection.gpuResourcePolicy }}
{{- end }}

{{/*
The deprecated webhook.* names set in these values (for NOTES.txt), one per line as
"webhook.X injection.Y".
*/}}
{{- define "gpu-scheduler.deprecatedInjectionValues" -}}
{{- range $old, $new := dict "injectionMode" "deviceMode" "gpuResourcePolicy" "gpuResourcePolicy" "excludeNamespaces" "excludeNamespaces" "namespaceSelector" "namespaceSelector" }}
{{- if not (kindIs "invalid" (index $.Values.webhook $old)) }}
webhook.{{ $old }} injection.{{ $new }}
{{- end }}
{{- end }}
{{- end }}

{{/*
namespaceSelector of both webhooks and of the policies' bindings: never the release
namespace (the webhook must not gate its own pods) nor injection.excludeNamespaces, ANDed
with injection.namespaceSelector (or their deprecated webhook.* names).
*/}}
{{- define "gpu-scheduler.namespaceSelector" -}}
{{- $exclude := .Values.injection.excludeNamespaces }}
{{- if not (kindIs "invalid" .Values.webhook.excludeNamespaces) }}
{{- $exclude = .Values.webhook.excludeNamespaces }}
{{- end }}
{{- $selector := .Values.injection.namespaceSelector }}
{{- if not (kindIs "invalid" .Values.webhook.namespaceSelector) }}
{{- $selector = .Values.webhook.namespaceSelector }}
{{- end }}
{{- with $selector.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- toYaml (uniq (prepend (default list $exclude) .Release.Namespace)) | nindent 6 }}
  {{- with $selector.matchExpressions }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/*
The namespaces injection serves (the selector above) as JSON, for the scheduler
(GPU_SCHEDULER_INJECTION_NAMESPACES): a replica admitted without its variables elsewhere waits
for its namespace to be opted in instead of being deleted and recreated.
*/}}
{{- define "gpu-scheduler.namespaceSelectorJson" -}}
{{- include "gpu-scheduler.namespaceSelector" . | fromYaml | toJson }}
{{- end }}

{{/*
"true" when something injects the GPU variables: the webhook, or the injection policy.
*/}}
{{- define "gpu-scheduler.injects" -}}
{{- if or .Values.webhook.enabled (eq (include "gpu-scheduler.injectionMode" .) "policy") }}true{{- end }}
{{- end }}

{{/*
Tenancy: the ConfigMap the scheduler publishes the resolved grants to (policy.<name> -> nodes,
ns.<namespace> -> policies), read by the tenancy ValidatingAdmissionPolicy and the webhook.
*/}}
{{- define "gpu-scheduler.grantsName" -}}
{{- printf "%s-grants" (include "gpu-scheduler.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The OpenAPI schema of a metav1.LabelSelector (the GPUPinningPolicy CRD's two selectors).
*/}}
{{- define "gpu-scheduler.labelSelectorSchema" -}}
type: object
x-kubernetes-map-type: atomic
properties:
  matchLabels:
    type: object
    additionalProperties:
      type: string
  matchExpressions:
    type: array
    items:
      type: object
      required: [key, operator]
      properties:
        key:
          type: string
          minLength: 1
        operator:
          type: string
          enum: [In, NotIn, Exists, DoesNotExist]
        values:
          type: array
          items:
            type: string
      x-kubernetes-validations:
        - rule: "(self.operator == 'In' || self.operator == 'NotIn') == (has(self.values) && size(self.values) > 0)"
          message: In and NotIn need values; Exists and DoesNotExist take none
{{- end }}

{{/*
Extender mode: names, labels, the kube-scheduler image.
*/}}
{{- define "gpu-scheduler.kubeSchedulerName" -}}
{{- printf "%s-kube-scheduler" (include "gpu-scheduler.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-scheduler.extenderServiceName" -}}
{{- printf "%s-extender" (include "gpu-scheduler.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-scheduler.extenderSecretName" -}}
{{- default (printf "%s-tls" (include "gpu-scheduler.extenderServiceName" .)) .Values.extender.tls.existingSecret }}
{{- end }}

{{- define "gpu-scheduler.kubeSchedulerServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-scheduler.kubeSchedulerName" .) .Values.extender.kubeScheduler.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.extender.kubeScheduler.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Selector labels of the kube-scheduler pods: another app.kubernetes.io/name, so neither
the scheduler's nor the webhook's selector adopts them.
*/}}
{{- define "gpu-scheduler.kubeSchedulerSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-kube-scheduler" (include "gpu-scheduler.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kube-scheduler
{{- end }}

{{- define "gpu-scheduler.kubeSchedulerPodLabels" -}}
helm.sh/chart: {{ include "gpu-scheduler.chart" . }}
{{ include "gpu-scheduler.kubeSchedulerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-scheduler
{{- end }}

{{- define "gpu-scheduler.kubeSchedulerLabels" -}}
{{ include "gpu-scheduler.labels" . }}
app.kubernetes.io/component: kube-scheduler
{{- end }}

{{/*
kube-scheduler image: extender.kubeScheduler.image.tag, else the cluster's version
(vMAJOR.MINOR.PATCH of .Capabilities.KubeVersion, without a distribution's suffix).
*/}}
{{- define "gpu-scheduler.kubeSchedulerImage" -}}
{{- $img := .Values.extender.kubeScheduler.image }}
{{- $tag := $img.tag | default (regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version) }}
{{- include "gpu-scheduler.imageRef" (dict "root" . "registry" $img.registry "repository" $img.repository "tag" $tag) }}
{{- end }}

{{/*
The extender's URL as kube-scheduler calls it.
*/}}
{{- define "gpu-scheduler.extenderUrl" -}}
{{- if .Values.extender.url }}
{{- trimSuffix "/" .Values.extender.url }}
{{- else }}
{{- printf "https://%s.%s.svc:%d" (include "gpu-scheduler.extenderServiceName" .) .Release.Namespace (int .Values.extender.port) }}
{{- end }}
{{- end }}

{{/*
Fail early on webhook settings that cannot work.
*/}}
{{- define "gpu-scheduler.validateValues" -}}
{{- if not (has .Values.injection.mode (list "auto" "webhook" "policy")) }}
{{- fail (printf "injection.mode must be auto, webhook or policy, not %q" (toString .Values.injection.mode)) }}
{{- end }}
{{- /* injection.mode=policy with webhook.enabled: both inject (the same variables), the middle
step of moving from webhook to policy with no window (docs/injection.md); NOTES.txt says so. */}}
{{- if and (eq .Values.injection.mode "policy") (not (include "gpu-scheduler.servesMutatingPolicy" .)) }}
{{- fail (printf "injection.mode=policy needs admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes >= 1.36), which this cluster does not serve (Kubernetes %s; with `helm template`, pass --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy): use injection.mode=webhook, or auto" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if .Values.dra.enabled }}
{{- if ne (include "gpu-scheduler.injectionMode" .) "policy" }}
{{- fail "dra.enabled needs the injection policy (injection.mode=policy, or auto on Kubernetes >= 1.36 with webhook.enabled=false): the MutatingAdmissionPolicy gives each replica its ResourceClaim; the webhook does not" }}
{{- end }}
{{- if .Values.webhook.enabled }}
{{- fail "dra.enabled and webhook.enabled exclude each other: in DRA mode the policy gives each replica its ResourceClaim, and the webhook would inject CUDA_VISIBLE_DEVICES for GPUs the container does not see by those numbers" }}
{{- end }}
{{- if .Values.extender.enabled }}
{{- fail "dra.enabled and extender.enabled exclude each other: in DRA mode the cluster's kube-scheduler (dra.schedulerName) places the replicas" }}
{{- end }}
{{- if not (.Capabilities.APIVersions.Has "resource.k8s.io/v1/ResourceClaim") }}
{{- fail (printf "dra.enabled needs resource.k8s.io/v1 (Kubernetes >= 1.34), which this cluster does not serve (Kubernetes %s; with `helm template`, pass --api-versions resource.k8s.io/v1/ResourceClaim)" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- end }}
{{- if .Values.extender.enabled }}
{{- if not .Values.extender.tls.caBundle }}
{{- fail "extender.enabled needs extender.tls.caBundle (base64 PEM of the CA that signed the extender's serving certificate; kube-scheduler verifies the extender with it)" }}
{{- end }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- fail "extender.enabled needs replicaCount: 1 (only the leader answers kube-scheduler, and readiness follows leadership: a standby would never be ready)" }}
{{- end }}
{{- if or (and .Values.extender.tls.crt (not .Values.extender.tls.key)) (and .Values.extender.tls.key (not .Values.extender.tls.crt)) }}
{{- fail "extender.tls.crt and extender.tls.key go together" }}
{{- end }}
{{- if and .Values.extender.tls.existingSecret .Values.extender.tls.crt }}
{{- fail "extender.tls.existingSecret excludes extender.tls.crt/key" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 0) (not .Values.extender.url) (not (or .Values.extender.tls.crt .Values.extender.tls.existingSecret)) }}
{{- fail "extender.enabled needs a serving certificate for the gpu-scheduler pod: extender.tls.crt/key or extender.tls.existingSecret" }}
{{- end }}
{{- end }}
{{- if .Values.webhook.enabled }}
{{- if and .Values.webhook.url (not (hasPrefix "https://" .Values.webhook.url)) }}
{{- fail "webhook.url must start with https:// (the apiserver only calls webhooks over TLS)" }}
{{- end }}
{{- if and (not .Values.webhook.caBundle) (or .Values.webhook.url (not .Values.webhook.certManager.enabled)) }}
{{- fail "webhook.enabled needs webhook.caBundle (base64 PEM of the CA that signed the webhook certificate), or webhook.certManager.enabled=true" }}
{{- end }}
{{- if and .Values.webhook.clientAuth.enabled (not .Values.webhook.clientAuth.caBundle) }}
{{- fail "webhook.clientAuth.enabled needs webhook.clientAuth.caBundle (base64 PEM of the CA that signs the apiserver's client certificate)" }}
{{- end }}
{{- if and .Values.webhook.clientAuth.enabled .Values.webhook.url }}
{{- fail "webhook.clientAuth configures the in-cluster webhook: with webhook.url set WEBHOOK_CLIENT_CA_FILE on the process you run" }}
{{- end }}
{{- if or (and .Values.webhook.tls.crt (not .Values.webhook.tls.key)) (and .Values.webhook.tls.key (not .Values.webhook.tls.crt)) }}
{{- fail "webhook.tls.crt and webhook.tls.key go together" }}
{{- end }}
{{- if and .Values.webhook.tls.crt .Values.webhook.certManager.enabled }}
{{- fail "choose one certificate source: webhook.tls or webhook.certManager" }}
{{- end }}
{{- if and .Values.webhook.existingSecret (or .Values.webhook.tls.crt .Values.webhook.certManager.enabled) }}
{{- fail "webhook.existingSecret excludes webhook.tls and webhook.certManager" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
NetworkPolicy egress rule to the kube-apiserver (networkPolicy.apiserver): its ports,
towards its peers (any address when none are given).
*/}}
{{- define "gpu-scheduler.apiserverEgress" -}}
- ports:
    {{- range .Values.networkPolicy.apiserver.ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with .Values.networkPolicy.apiserver.peers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
NetworkPolicy egress rule to DNS (networkPolicy.egress.dnsPeers; any address when none).
*/}}
{{- define "gpu-scheduler.dnsEgress" -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
  {{- with .Values.networkPolicy.egress.dnsPeers }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
Image of the helm test pods.
*/}}
{{- define "gpu-scheduler.testImage" -}}
{{- $img := .Values.tests.image }}
{{- if or $img.repository $img.tag }}
{{- include "gpu-scheduler.imageRef" (dict "root" . "registry" .Values.image.registry "repository" (default .Values.image.repository $img.repository) "tag" (default (default .Chart.AppVersion .Values.image.tag) $img.tag)) }}
{{- else }}
{{- include "gpu-scheduler.image" . }}
{{- end }}
{{- end }}

{{/*
Pod-level settings shared by the helm test pods.
*/}}
{{- define "gpu-scheduler.testPodSpec" -}}
restartPolicy: Never
automountServiceAccountToken: false
enableServiceLinks: false
{{- include "gpu-scheduler.imagePullSecrets" . }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- /* Where the scheduler and the webhook run (control-plane nodes preferred by default): the
       test pods check them from there, on a node that really runs pods. */}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "gpu-scheduler.affinity" (dict "root" . "affinity" .Values.affinity) }}
{{- end }}

{{/*
The map's whitespace inside a line, as an RE2 character class: what Python's str.isspace()
accepts (schedmap.parse strips it around every token) less "\n", which ends the line.
*/}}
{{- define "gpu-scheduler.mapSpace" -}}
[\t\v\f\r\x1c-\x1f\x85\pZ]
{{- end }}

{{/*
CEL, for the map policy's messages: `[line, entry]` (line as a string, the entry stripped)
of every entry `c` of the map, in text order, for which the CEL condition in the
argument holds. One pass over the comment-free lines (variables.lines).
*/}}
{{- define "gpu-scheduler.mapHits" -}}
variables.lines.transformList(i, l, l.split(';').filter(c, c.contains('=') && ({{ . }})).map(c, [string(i + 1), c.trim()])).flatten()
{{- end }}

{{/*
CEL: schedmap's rendering of a problem in an entry. Argument: (list H PROBLEM), two CEL
expressions: the entry as [line, entry] and the problem's text.
*/}}
{{- define "gpu-scheduler.mapSay" -}}
{{- $h := index . 0 -}}
'line ' + {{ $h }}[0] + ': ' + {{ index . 1 }} + " (in '" + (size({{ $h }}[1]) > 48 ? {{ $h }}[1].substring(0, 47) + '…' : {{ $h }}[1]).replace('\r', '\\r').replace('\n', '\\n') + "')"
{{- end }}

{{/*
Shared GPUs, in CEL (kube_gpu_scheduler.domain.schedmap.SchedulingMap.shared, sharing_problems and
kube_gpu_scheduler.domain.sharing.warning, word for word). Fragments of an entry `E` as written
(comments cut): its node, its GPU tokens, a GPU token's normal form, its ordinal without leading
zeros (a string), its "node:gpu" pairs, its canonical text (str(Entry)). None of them fails on a
malformed entry (the map policy refuses that one with its own words).
*/}}
{{- define "gpu-scheduler.celNode" -}}
{{ . }}.substring({{ . }}.indexOf('=') + 1).find('[a-z0-9.-]+')
{{- end }}

{{- define "gpu-scheduler.celGpus" -}}
{{ . }}.substring({{ . }}.indexOf(':') + 1).findAll(r'[\w.:-]+')
{{- end }}

{{- define "gpu-scheduler.celNorm" -}}
(size({{ . }}) == 40 && !{{ . }}.startsWith('0') ? 'GPU-' + {{ . }}.substring(4).lowerAscii() : {{ . }}.contains(':') ? (size({{ . }}) == 16 && {{ . }}.startsWith('0000') ? {{ . }}.substring(4) : {{ . }}).lowerAscii() : {{ . }}.find('[1-9][0-9]*') == '' ? '0' : {{ . }}.find('[1-9][0-9]*'))
{{- end }}

{{- define "gpu-scheduler.celOrdinal" -}}
({{ . }}.find('[0-9]+').find('[1-9][0-9]*') == '' ? '0' : {{ . }}.find('[0-9]+').find('[1-9][0-9]*'))
{{- end }}

{{- define "gpu-scheduler.celPairs" -}}
{{ include "gpu-scheduler.celGpus" . }}.map(gpu, {{ include "gpu-scheduler.celNode" . }} + ':' + {{ include "gpu-scheduler.celNorm" "gpu" }})
{{- end }}

{{- define "gpu-scheduler.celCanon" -}}
({{ include "gpu-scheduler.celOrdinal" . }} + '=' + {{ include "gpu-scheduler.celNode" . }} + ':' + {{ include "gpu-scheduler.celGpus" . }}.map(gpu, {{ include "gpu-scheduler.celNorm" "gpu" }}).join(','))
{{- end }}

{{/* CEL: the string `.` left-padded with zeros to 7 characters (a line or an ordinal, to compare as text). */}}
{{- define "gpu-scheduler.celPad7" -}}
('000000' + {{ . }}).substring(size({{ . }}) - 1)
{{- end }}

{{/* CEL: schedmap.excerpt of the string `.` (48 characters at most). */}}
{{- define "gpu-scheduler.celExcerpt" -}}
(size({{ . }}) > 48 ? {{ . }}.substring(0, 47) + '…' : {{ . }})
{{- end }}

{{/*
The variables (a YAML list, to indent) that name a map's first sharing problem as
schedmap.sharing_problems(smap, WHY) says it (str of its first Problem): in entry order (line,
then ordinal), the first entry naming a GPU that an earlier entry names, its first such GPU and
the first entry naming that GPU. Argument: (list OWNED WHY): CEL of every "node:gpu" pair of the
map (a list of at most 400: sort() costs n^2) and of the reason. Needs variables.lines (the
lines without their comments). Each is computed only for a map that shares (named *Message*).
*/}}
{{- define "gpu-scheduler.sharingMessageVariables" -}}
{{- $owned := index . 0 }}
{{- $why := index . 1 }}
- name: sharingMessageSorted
  expression: "{{ $owned }}.sort()"
# Each "node:gpu" that two entries or more name, once.
- name: sharingMessageShared
  expression: >-
    variables.sharingMessageSorted.transformList(i, v, i > 0 && variables.sharingMessageSorted[i - 1] == v &&
    (i == 1 || variables.sharingMessageSorted[i - 2] != v) ? [v] : []).flatten()
# [line, entry] of each entry that names one, its pairs, and its (line, ordinal) as one string.
- name: sharingMessageHits
  expression: >-
    {{ include "gpu-scheduler.mapHits" (printf "%s.exists(p, p in variables.sharingMessageShared)" (include "gpu-scheduler.celPairs" "c")) }}
- name: sharingMessagePairs
  expression: >-
    variables.sharingMessageHits.map(h, {{ include "gpu-scheduler.celPairs" "h[1]" }})
- name: sharingMessageKeys
  expression: >-
    variables.sharingMessageHits.map(h, {{ include "gpu-scheduler.celPad7" "h[0]" }} + {{ include "gpu-scheduler.celPad7" (include "gpu-scheduler.celOrdinal" "h[1]") }})
# For each shared pair, the first entry (line, ordinal) that names it.
- name: sharingMessageFirst
  expression: >-
    variables.sharingMessageShared.transformMapEntry(i, p, {p: variables.sharingMessageHits.transformList(j, h,
    p in variables.sharingMessagePairs[j] ? [variables.sharingMessageKeys[j]] : []).flatten().min()})
# The entries that name a pair an earlier entry names, and the first of them.
- name: sharingMessageLaters
  expression: >-
    variables.sharingMessageHits.transformList(j, h, variables.sharingMessagePairs[j].exists(p,
    p in variables.sharingMessageFirst && variables.sharingMessageFirst[p] < variables.sharingMessageKeys[j]) ? [j] : []).flatten()
- name: sharingMessageAt
  expression: >-
    variables.sharingMessageLaters.filter(j, variables.sharingMessageKeys[j] ==
    variables.sharingMessageLaters.map(k, variables.sharingMessageKeys[k]).min())[0]
- name: sharingMessageClash
  expression: >-
    variables.sharingMessagePairs[variables.sharingMessageAt].filter(p, p in variables.sharingMessageFirst &&
    variables.sharingMessageFirst[p] < variables.sharingMessageKeys[variables.sharingMessageAt])[0]
- name: sharingMessageOther
  expression: >-
    variables.sharingMessageHits[variables.sharingMessageKeys.indexOf(variables.sharingMessageFirst[variables.sharingMessageClash])]
- name: sharingMessageWhy
  expression: >-
    variables.sharingMessageClash + ' is also given to ordinal ' + {{ include "gpu-scheduler.celOrdinal" "variables.sharingMessageOther[1]" }} +
    ' on line ' + variables.sharingMessageOther[0] + ': ' + {{ $why }}
- name: sharingMessage
  expression: >-
    'line ' + variables.sharingMessageHits[variables.sharingMessageAt][0] + ': ' +
    (size(variables.sharingMessageWhy) > 300 ? variables.sharingMessageWhy.substring(0, 299) + '…' : variables.sharingMessageWhy) +
    " (in '" + {{ include "gpu-scheduler.celExcerpt" (include "gpu-scheduler.celCanon" "variables.sharingMessageHits[variables.sharingMessageAt][1]") }} + "')"
{{- end }}

{{/* DRA mode: the ConfigMap the scheduler publishes each node's GPU topology to (topology-policy.yaml). */}}
{{- define "gpu-scheduler.topologyName" -}}
{{- printf "%s-topology" (include "gpu-scheduler.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
