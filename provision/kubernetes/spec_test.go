package kubernetes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"kernelgate/kernelspecs"
)

// The kernel pod is built from typed values: what a client or kernelspec
// gives lands in fields, never in text that is parsed again; it runs
// non-root without a service-account token, its key comes from its
// Secret and its ports are the fixed ones.
func TestPodSpec(t *testing.T) {
	spec := &kernelspecs.Spec{Name: "python3", Dir: "/specs/python3", Argv: []string{"python3", "-f", "{connection_file}", "{resource_dir}/x"},
		Env: map[string]string{"SPEC_VAR": "1"},
		Metadata: map[string]any{"kernel_provisioner": map[string]any{"provisioner_name": "kubernetes-provisioner", "config": map[string]any{
			"image":           "img:1",
			"node_selector":   map[string]any{"pool": "kernels"},
			"tolerations":     []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "kernels", "effect": "NoSchedule"}},
			"service_account": "kernel-sa",
			"resources":       map[string]any{"limits": map[string]any{"cpu": "1"}},
			"secret_env":      map[string]any{"TOKEN": "creds/token"},
		}}}}
	cfg, err := ParseConfig(spec)
	if err != nil {
		t.Fatal(err)
	}
	hostile := "x\"; rm -rf / #\n---\nkind: Pod"
	pod, err := buildPod(podParams{Name: "kernel-abc-12345", Namespace: "ns", Release: "rel", KernelID: "abc", Spec: spec, Config: cfg,
		Env: map[string]string{"KERNEL_USER": hostile}, MemoryBytes: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	if *pod.Spec.AutomountServiceAccountToken || pod.Spec.ServiceAccountName != "kernel-sa" || !*pod.Spec.SecurityContext.RunAsNonRoot ||
		!*c.SecurityContext.RunAsNonRoot || *c.SecurityContext.AllowPrivilegeEscalation || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("pod security: %+v %+v", pod.Spec, c.SecurityContext)
	}
	if pod.Spec.NodeSelector["pool"] != "kernels" || len(pod.Spec.Tolerations) != 1 || pod.Spec.Tolerations[0].Key != "dedicated" {
		t.Errorf("placement: %v %v", pod.Spec.NodeSelector, pod.Spec.Tolerations)
	}
	if got := strings.Join(append(c.Command, c.Args...), " "); got != "kernelgate kernel-entry -- python3 -f {connection_file} /specs/python3/x" {
		t.Errorf("command: %s", got)
	}
	if c.Resources.Limits.Memory().Value() != 512<<20 || c.Resources.Limits.Cpu().String() != "1" {
		t.Errorf("resources: %v", c.Resources.Limits)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env[EnvKey]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef.Name != pod.Name || e.ValueFrom.SecretKeyRef.Key != SecretKey {
		t.Errorf("key env: %+v", e)
	}
	if e := env[EnvIP]; e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("ip env: %+v", e)
	}
	if env["KERNEL_USER"].Value != hostile || env["SPEC_VAR"].Value != "1" || env["TOKEN"].ValueFrom.SecretKeyRef.Name != "creds" {
		t.Errorf("env: %+v", env)
	}
	if len(c.Ports) != 5 || c.Ports[0].ContainerPort != 52700 || c.Ports[4].ContainerPort != 52704 {
		t.Errorf("ports: %+v", c.Ports)
	}
	if pod.Labels[LabelRelease] != "rel" || pod.Labels[LabelKernelID] != "abc" || pod.Labels[LabelKind] != "jupyter" || pod.Annotations[AnnotationSpec] != "python3" {
		t.Errorf("labels %v annotations %v", pod.Labels, pod.Annotations)
	}
	s := buildSecret(podParams{Name: pod.Name, Namespace: "ns", Release: "rel", KernelID: "abc"}, "k3y")
	if string(s.Data[SecretKey]) != "k3y" || s.Labels[LabelRelease] != "rel" {
		t.Errorf("secret: %+v", s)
	}

	for _, bad := range []map[string]any{
		{},                               // no image
		{"image": "x", "imagee": "typo"}, // unknown field
		{"image": "x", "secret_env": map[string]any{"A": "nokey"}},
	} {
		s := &kernelspecs.Spec{Name: "bad", Metadata: map[string]any{"kernel_provisioner": map[string]any{"provisioner_name": "kubernetes-provisioner", "config": bad}}}
		if _, err := ParseConfig(s); err == nil {
			t.Errorf("config %v accepted", bad)
		}
	}
}
