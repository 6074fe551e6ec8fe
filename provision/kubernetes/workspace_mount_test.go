package kubernetes

import (
	"context"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"kernelgate/jupyter"
)

// With a workspace claim, a kernel working in a folder of the workspace
// root mounts that folder of the claim (its subPath) at the same path,
// and nothing else of it; the gateway's variables naming folders in it
// reach the kernel. A kernel working elsewhere, or a provisioner without
// a claim, mounts nothing.
func TestLaunchMountsTheContextsFolder(t *testing.T) {
	const root = "/var/lib/kernelgate/workspaces"
	for _, c := range []struct {
		name, claim, cwd string
		fresh            bool
		subPath, workDir string
	}{
		{name: "context", claim: "kernelgate-workspaces", cwd: root + "/ctx-agent", fresh: true, subPath: "ctx-agent"},
		{name: "isolated run", claim: "kernelgate-workspaces", cwd: root + "/runs/r1", subPath: "runs/r1", workDir: root + "/runs/r1"},
		{name: "outside the root", claim: "kernelgate-workspaces", cwd: "/home/user/notebooks"},
		{name: "the root itself", claim: "kernelgate-workspaces", cwd: root},
		{name: "escaping the root", claim: "kernelgate-workspaces", cwd: root + "/../state"},
		{name: "no claim", cwd: root + "/ctx-agent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset()
			p := &Provisioner{Client: client, Namespace: "kernels", Release: "rel", WorkspaceClaim: c.claim, WorkspaceRoot: root}
			if err := p.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Stop)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				p.Launch(ctx, jupyter.LaunchRequest{KernelID: "0d7a1a0e-1111-4222-8333-444455556666", Spec: testSpec(), Kind: "context",
					Cwd: c.cwd, StartFresh: c.fresh, DirEnv: map[string]string{"DENO_DIR": c.cwd + "/.cache/deno"}})
			}()
			pod := createdPod(t, client)
			cancel()
			<-ended
			ctr := pod.Spec.Containers[0]
			env := map[string]string{}
			for _, e := range ctr.Env {
				env[e.Name] = e.Value
			}
			if c.subPath == "" {
				if len(pod.Spec.Volumes) != 0 || len(ctr.VolumeMounts) != 0 || env["DENO_DIR"] != "" {
					t.Errorf("volumes %+v, mounts %+v, DENO_DIR %q: want none", pod.Spec.Volumes, ctr.VolumeMounts, env["DENO_DIR"])
				}
				return
			}
			want := corev1.VolumeMount{Name: workspaceVolumeName, MountPath: c.cwd, SubPath: c.subPath}
			if len(pod.Spec.Volumes) != 1 || pod.Spec.Volumes[0].PersistentVolumeClaim == nil || pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != c.claim ||
				len(ctr.VolumeMounts) != 1 || !reflect.DeepEqual(ctr.VolumeMounts[0], want) {
				t.Errorf("volumes %+v, mounts %+v: want claim %s, %+v", pod.Spec.Volumes, ctr.VolumeMounts, c.claim, want)
			}
			if ctr.WorkingDir != c.workDir {
				t.Errorf("workingDir %q, want %q", ctr.WorkingDir, c.workDir)
			}
			if env["DENO_DIR"] != c.cwd+"/.cache/deno" {
				t.Errorf("DENO_DIR %q", env["DENO_DIR"])
			}
			if !p.Capabilities(nil).OwnWorkspace {
				t.Errorf("a provisioner mounting one folder per kernel says its kernels may change workspace")
			}
		})
	}
}
