{{/*
Name of the chart, overridable with nameOverride.
*/}}
{{- define "gpu-scheduler-check.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified name: "<release>-<chart>", or the release name when it already
contains the chart name. StatefulSet pod names add "-N" and the
controller-revision-hash label adds a hash: keep it at most 52 characters.
*/}}
{{- define "gpu-scheduler-check.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart label value: name-version.
*/}}
{{- define "gpu-scheduler-check.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: only name and instance.
*/}}
{{- define "gpu-scheduler-check.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-scheduler-check.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The selector as a kubectl/API label selector string.
*/}}
{{- define "gpu-scheduler-check.selector" -}}
{{- printf "app.kubernetes.io/name=%s,app.kubernetes.io/instance=%s" (include "gpu-scheduler-check.name" .) .Release.Name }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "gpu-scheduler-check.labels" -}}
helm.sh/chart: {{ include "gpu-scheduler-check.chart" . }}
{{ include "gpu-scheduler-check.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-scheduler
{{- end }}

{{/*
Selector labels of the check pods (the NetworkPolicy's podSelector): the selector
labels and the component, so no other pod of the release (the helm test pod) matches.
*/}}
{{- define "gpu-scheduler-check.checkPodSelectorLabels" -}}
{{ include "gpu-scheduler-check.selectorLabels" . }}
app.kubernetes.io/component: check
{{- end }}

{{/*
Selector labels of the helm test pod: its own app.kubernetes.io/name "<name>-test", so
the StatefulSet's selector and the headless Service never pick it.
*/}}
{{- define "gpu-scheduler-check.testSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-test" (include "gpu-scheduler-check.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{- end }}

{{/*
Labels of the wait-ready hook Pod: the test pods' name, so that neither the StatefulSet's
headless Service nor the check pods' NetworkPolicy selects it, and the test pods'
NetworkPolicy does.
*/}}
{{- define "gpu-scheduler-check.waitReadyPodLabels" -}}
helm.sh/chart: {{ include "gpu-scheduler-check.chart" . }}
app.kubernetes.io/name: {{ printf "%s-test" (include "gpu-scheduler-check.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: wait-ready
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-scheduler
{{- end }}

{{/*
Labels of the helm test objects.
*/}}
{{- define "gpu-scheduler-check.testLabels" -}}
helm.sh/chart: {{ include "gpu-scheduler-check.chart" . }}
{{ include "gpu-scheduler-check.testSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-scheduler
{{- end }}

{{/*
ServiceAccount name of the check pods.
*/}}
{{- define "gpu-scheduler-check.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-scheduler-check.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference, REPOSITORY@DIGEST when a digest is given, else REPOSITORY:TAG, with the
registry a mirror gives: global.imageRegistry (a parent chart's, or --set global.imageRegistry)
over image.registry over the one the repository names. Either replaces the repository's
registry, its first component when that has a "." or a ":" or is "localhost" (Docker's rule),
and keeps its path (the scheduler chart's "gpu-scheduler.imageRef", the same rule).
Call: include "gpu-scheduler-check.imageRef" (dict "root" $ "repository" P "tag" T "digest" D)
*/}}
{{- define "gpu-scheduler-check.imageRef" -}}
{{- $registry := ((.root.Values.global).imageRegistry) | default .root.Values.image.registry | default "" }}
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
Container image: repository@digest when image.digest is set, else repository:tag (default:
the chart's appVersion); the registry as "gpu-scheduler-check.imageRef" says.
*/}}
{{- define "gpu-scheduler-check.image" -}}
{{- include "gpu-scheduler-check.imageRef" (dict "root" . "repository" .Values.image.repository "tag" (default .Chart.AppVersion .Values.image.tag) "digest" .Values.image.digest) }}
{{- end }}

{{/*
imagePullSecrets: global.imagePullSecrets (a parent chart's; names or {name} objects) then
imagePullSecrets, without duplicates; at the pod spec's indentation.
*/}}
{{- define "gpu-scheduler-check.imagePullSecrets" -}}
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
Image of the helm test pod.
*/}}
{{- define "gpu-scheduler-check.testImage" -}}
{{- $img := .Values.tests.image }}
{{- if or $img.repository $img.tag }}
{{- include "gpu-scheduler-check.imageRef" (dict "root" . "repository" (default .Values.image.repository $img.repository) "tag" (default (default .Chart.AppVersion .Values.image.tag) $img.tag)) }}
{{- else }}
{{- include "gpu-scheduler-check.image" . }}
{{- end }}
{{- end }}

{{/*
The gpu-scheduling-map annotation: one "podIndex=nodeName:gpuDevices" line per entry,
ordered by podIndex. Fails when a replica has no entry, an index is given twice, or an entry asks
for a count (auto(N)) outside DRA mode.
*/}}
{{- define "gpu-scheduler-check.schedulingMap" -}}
{{- $byIndex := dict }}
{{- range .Values.gpuScheduling.schedulingMap }}
{{- $key := printf "%d" (int .podIndex) }}
{{- if hasKey $byIndex $key }}
{{- fail (printf "gpuScheduling.schedulingMap: podIndex %s is given twice" $key) }}
{{- end }}
{{- $gpus := regexReplaceAll "\\s+" (toString .gpuDevices) "" }}
{{- if and (hasPrefix "auto(" $gpus) (ne $.Values.gpuScheduling.injectionMode "dra") }}
{{- fail (printf "gpuScheduling.schedulingMap: podIndex %s asks for a count (%s), which only DRA mode gives GPUs for: set gpuScheduling.injectionMode=dra (the scheduler chart's dra.enabled)" $key $gpus) }}
{{- end }}
{{- $_ := set $byIndex $key (printf "%d=%s:%s" (int .podIndex) .nodeName $gpus) }}
{{- end }}
{{- range $i := until (int .Values.replicaCount) }}
{{- if not (hasKey $byIndex (printf "%d" $i)) }}
{{- fail (printf "replicaCount is %d but gpuScheduling.schedulingMap has no entry for podIndex %d" (int $.Values.replicaCount) $i) }}
{{- end }}
{{- end }}
{{- $max := -1 }}
{{- range .Values.gpuScheduling.schedulingMap }}
{{- if gt (int .podIndex) $max }}{{ $max = int .podIndex }}{{ end }}
{{- end }}
{{- $lines := list }}
{{- range $i := until (add1 $max | int) }}
{{- with get $byIndex (printf "%d" $i) }}{{ $lines = append $lines . }}{{ end }}
{{- end }}
{{- join "\n" $lines }}
{{- end }}

{{/*
Argo CD hook annotations of the verification pod and its RBAC (tests.argocdHook): a Sync
hook recreated on every sync, removed after a successful one (a failed one stays for
`kubectl logs`). Wave "0", the resources' own: without it Argo CD takes the helm.sh/hook-weight
as the wave, and a sync with several waves waits for every resource to be Healthy before
it looks at the hook (a misplaced replica never is). For the same reason no other hook of
the chart is in another wave (the pre-install wait-ready hook is skipped by Argo CD). Within
the wave Argo CD creates the ServiceAccount, Roles and RoleBindings before the Pod (kind order).
*/}}
{{- define "gpu-scheduler-check.argocdHook" -}}
{{- if .Values.tests.argocdHook -}}
argocd.argoproj.io/hook: Sync
argocd.argoproj.io/hook-delete-policy: BeforeHookCreation,HookSucceeded
argocd.argoproj.io/sync-wave: "0"
{{- end -}}
{{- end }}

{{/*
Placement of the hook pods (hookPods): nodeSelector, tolerations and affinity, at the pod
spec's indentation. They only call the API, so they go where the scheduler and the webhook
run (control-plane nodes preferred by default, never required), never to the GPU nodes the
map names.
*/}}
{{- define "gpu-scheduler-check.hookPodPlacement" -}}
{{- with .Values.hookPods.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.hookPods.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.hookPods.preferControlPlane }}
affinity:
  nodeAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        preference:
          matchExpressions:
            - key: node-role.kubernetes.io/control-plane
              operator: Exists
{{- end }}
{{- end }}

{{/*
Hook annotations of the pre-install wait-ready Pod and its RBAC (templates/wait-ready.yaml),
called with (dict "weight" "-N"): Helm runs them before install and before every upgrade,
in weight order (RBAC, then the Pod), and deletes them once every hook of the phase
succeeded. Argo CD skips them (argocd.argoproj.io/hook: Skip; Argo CD ignores the helm.sh
annotations when its own are present): under Argo CD the verification Pod's first
container waits instead (templates/tests/verify-release.yaml), because any hook outside
wave 0 makes the sync multi-step, and a multi-step sync waits for every resource to be
Healthy before a failed hook can end it (a misplaced replica never is).
*/}}
{{- define "gpu-scheduler-check.waitReadyHook" -}}
helm.sh/hook: pre-install,pre-upgrade
helm.sh/hook-weight: {{ .weight | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
argocd.argoproj.io/hook: Skip
{{- end }}

{{/*
The wait-ready command's arguments (after `wait-ready`), for a Pod of ServiceAccount
.sa: the pre-install hook and the verification Pod's init container run the same.
Called with (dict "ctx" $ "sa" NAME).
*/}}
{{- define "gpu-scheduler-check.waitReadyArgs" -}}
{{- $ := .ctx -}}
- --namespace
- {{ $.Release.Namespace }}
- --map
- {{ include "gpu-scheduler-check.schedulingMap" $ | quote }}
- --scheduler-name
- {{ $.Values.schedulerName | quote }}
- --mode
- {{ $.Values.gpuScheduling.injectionMode }}
- --lease-namespace
- {{ $.Values.waitReady.lease.namespace }}
- --lease-name
- {{ $.Values.waitReady.lease.name | quote }}
- --image
- {{ include "gpu-scheduler-check.image" $ | quote }}
- --service-account
- {{ .sa }}
- --timeout
- {{ $.Values.waitReady.timeoutSeconds | quote }}
- --interval
- {{ $.Values.waitReady.intervalSeconds | quote }}
- --termination-message-path
- /dev/termination-log
{{- end }}
