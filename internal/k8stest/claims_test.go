//go:build linux

package k8stest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"kernelgate/internal/needs"
)

// TestClaimMounts: a pod mounting a folder of a claim the node was given
// sees that folder at its mountPath, with what the host writes there and
// writing what the host reads, and nothing else of the claim; a command
// exec runs in it sees the same.
func TestClaimMounts(t *testing.T) {
	if os.Getuid() != 0 {
		needs.Skip(t, "the test node mounts claims as root only")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		needs.Skip(t, "no nsenter: %v", err)
	}
	claim := t.TempDir()
	for _, dir := range []string{"ctx-a", "ctx-b"} {
		if err := os.MkdirAll(filepath.Join(claim, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(claim, "ctx-a", "in.txt"), []byte("for a"), 0o644)
	os.WriteFile(filepath.Join(claim, "ctx-b", "secret.txt"), []byte("for b only"), 0o644)

	cp := Start(t)
	StartNode(t, cp, NodeConfig{Images: map[string]Image{testImage: {}}, Claims: map[string]string{"workspaces": claim}})
	cp.CreateNamespace(t, "claims")
	c := &cluster{cp: cp, ns: "claims"}

	// Mounted at the same path as on the host, as kernelgate mounts a
	// context's folder; ctx-b is the claim's too but not mounted.
	at := filepath.Join(claim, "ctx-a")
	pod := newPod("reader", "sleep", "60")
	pod.Spec.Volumes = []corev1.Volume{{Name: "ws", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "workspaces"}}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "ws", MountPath: at, SubPath: "ctx-a"}}
	pod.Spec.Containers[0].WorkingDir = at
	c.create(t, pod)
	c.wait(t, "reader", "Running", running)
	// A pod that mounts none of the claim sees none of it.
	c.create(t, newPod("bystander", "sleep", "60"))
	c.wait(t, "bystander", "Running", running)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	script := `pwd; cat in.txt; echo; ls ..; cat ` + filepath.Join(claim, "ctx-b", "secret.txt") + ` 2>/dev/null || echo hidden; echo written > out.txt`
	out, errOut, err := c.execIn(t, ctx, viaSPDY, "reader", []string{"sh", "-c", script}, nil)
	if want := at + "\nfor a\nctx-a\nhidden\n"; err != nil || out != want {
		t.Errorf("in the pod: %q %q (%v), want %q: its workingDir, its folder's file, only its folder of the claim", out, errOut, err, want)
	}
	out, _, err = c.execIn(t, ctx, viaSPDY, "bystander", []string{"sh", "-c", "ls -A " + claim + "; cat " + at + "/in.txt 2>/dev/null || echo hidden"}, nil)
	if err != nil || out != "hidden\n" {
		t.Errorf("a pod mounting none of the claim sees of it: %q (%v), want nothing", out, err)
	}
	if b, err := os.ReadFile(filepath.Join(at, "out.txt")); err != nil || string(b) != "written\n" {
		t.Errorf("the pod's write read on the host: %q %v", b, err)
	}
}
