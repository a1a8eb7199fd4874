{{- /*
Helpers shared by every e2e chart. hack/package-charts.py copies this file into
each packaged chart (layer order: _shared, <chart>/_base, <chart>/<version>).
Every object name is derived from .Release.Name so that two releases of the
same chart can coexist in one namespace.
*/ -}}

{{- /* Labels put on every object. */ -}}
{{- define "e2e.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- /*
Selector of the Deployment (and Service). Includes the component so that hook
Job pods of the same release never match it. Must stay identical across chart
versions: a Deployment's selector is immutable.
*/ -}}
{{- define "e2e.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{- /* Container image; the tag defaults to the chart's appVersion. Nothing is ever pulled. */ -}}
{{- define "e2e.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- /*
Scheduling knobs for every pod spec (Deployment and hook Job); empty by
default. Use as:
  {{- with include "e2e.podScheduling" . | trim }}{{ . | nindent 6 }}{{ end }}
*/ -}}
{{- define "e2e.podScheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- /*
Container securityContext of every e2e pod: Pod Security "restricted". The
images (hack/build-images.sh) run as 65532 and write nothing.
*/ -}}
{{- define "e2e.containerSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- /*
The Deployment used by demo-app, hook-app and broken-app: named <release>,
.Values.replicaCount replicas. On the kwok test cluster its pods become
Running/Ready without any container runtime (kwok ignores volumes and probes).
On a real node the image (hack/build-images.sh) runs `busybox httpd` on :8080
serving /www, where the <release>-config ConfigMap's key `greeting` is
index.html; the readiness probe GETs it. A new greeting rolls the pods.
*/ -}}
{{- define "e2e.deployment" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
  labels:
    {{- include "e2e.labels" . | nindent 4 }}
    app.kubernetes.io/component: server
spec:
  replicas: {{ .Values.replicaCount }}
  selector:
    matchLabels:
      {{- include "e2e.selectorLabels" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "e2e.labels" . | nindent 8 }}
        app.kubernetes.io/component: server
      annotations:
        # A new greeting rolls the pods: a mounted ConfigMap alone changes in them only
        # at the kubelet's next sync (up to a minute later).
        checksum/greeting: {{ .Values.greeting | toString | sha256sum | trunc 16 | quote }}
    spec:
      automountServiceAccountToken: false
      {{- with include "e2e.podScheduling" . | trim }}{{ . | nindent 6 }}{{ end }}
      containers:
        - name: app
          image: {{ include "e2e.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          ports:
            - name: http
              containerPort: 8080
              protocol: TCP
          readinessProbe:
            httpGet:
              path: /
              port: http
            periodSeconds: 5
          {{- include "e2e.containerSecurityContext" . | nindent 10 }}
          volumeMounts:
            - name: www
              mountPath: /www
              readOnly: true
      volumes:
        - name: www
          configMap:
            name: {{ .Release.Name }}-config
            items:
              - key: greeting
                path: index.html
{{- end -}}
