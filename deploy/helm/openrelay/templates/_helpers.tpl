{{- define "openrelay.labels" -}}
app.kubernetes.io/name: openrelay
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "openrelay.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* The environment of every product container: the operator's Secret, then the plain values. */}}
{{- define "openrelay.env" -}}
envFrom:
  - secretRef:
      name: {{ .Values.envFromSecret }}
env:
  - name: OPENRELAY_DATA_DIR
    value: /var/lib/openrelay
{{- range $name, $value := .Values.env }}
  - name: {{ $name }}
    value: {{ $value | quote }}
{{- end }}
{{- end -}}
