package barrier

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt with the actual output")

// TestScenarios replays every testdata/*.txt script. A script is a series of
// blocks: one command line, a "----" line, the expected output, a blank
// line. Lines starting with # are comments. Commands:
//
//	new n1,n2,n3 [attempts=N] [backoff=D] [backoffmax=D] [retryfor=D]
//	    [hooks=h1,h2] [marks=h1/before-commit/started,...] [verifier] [probes]
//	    [batches=n1/n2,n3]       staged: batch 1 is n1, batch 2 is n2 and n3
//	    [budget=D]               the lateness budget (Config.LateBudget)
//	    [wait]                   the wait policy (Config.LateWait)
//	                             a new operation (timeout 10s)
//	start                        Start
//	resume abort|verify|rollback|finalize ResumeAt
//	ended OUTCOME [REASON]       Ended (an operation read back from a journal)
//	ok NODE STEP[#ATTEMPT] [lateness=D]
//	                             Reply OK (attempt defaults to 1), applied D
//	                             after the commit instant
//	fail NODE STEP[#A] MESSAGE   Reply not OK
//	timeout NODE STEP[#A]        Timeout
//	deadline STEP[#A]            Deadline
//	late NODE [#A]               Late: no Commit answer by the answer
//	                             deadline (commit attempt A, default 1)
//	stepfail STEP REASON         StepFailed
//	journal-failed STEP[#A] ERROR
//	                             JournalFailed: the Journal of STEP#A was
//	                             not written
//	rollback [REASON]            RollbackRequested
//	hook NAME POINT [ERROR]      HookDone (ok without ERROR)
//	verified [ERROR]             Verified (passed without ERROR)
//	probes-reset                 ProbesReset
//	probes-read                  ProbesRead
//	state                        dump the state
//
// Every event's output is the actions it caused, then the state line.
// Run with -rewrite to regenerate the expected output.
func TestScenarios(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f) })
	}
}

type block struct {
	comments []string
	cmd      string
	want     string
}

func parseScenario(t *testing.T, text string) []block {
	var bs []block
	lines := strings.Split(text, "\n")
	var cur block
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "#") || (strings.TrimSpace(l) == "" && cur.cmd == ""):
			cur.comments = append(cur.comments, l)
		case cur.cmd == "":
			cur.cmd = l
			if i+1 >= len(lines) || lines[i+1] != "----" {
				t.Fatalf("line %d: command %q not followed by ----", i+1, l)
			}
			i++
			var out []string
			for i+1 < len(lines) && lines[i+1] != "" {
				i++
				out = append(out, lines[i])
			}
			cur.want = strings.Join(out, "\n")
			bs = append(bs, cur)
			cur = block{}
		}
	}
	return bs
}

func parseStep(t *testing.T, s string) (Step, int) {
	name, att, found := strings.Cut(s, "#")
	a := 1
	if found {
		var err error
		if a, err = strconv.Atoi(att); err != nil {
			t.Fatalf("bad attempt in %q", s)
		}
	}
	return Step(name), a
}

func runScenario(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks := parseScenario(t, string(raw))
	var op *Op
	var out strings.Builder
	for _, b := range blocks {
		f := strings.Fields(b.cmd)
		var got []string
		emit := func(acts []Action) {
			for _, a := range acts {
				got = append(got, fmt.Sprint(a))
			}
			if len(acts) == 0 {
				got = append(got, "(no action)")
			}
			got = append(got, strings.SplitN(op.String(), "\n", 2)[0])
		}
		switch f[0] {
		case "new":
			cfg := Config{Nodes: strings.Split(f[1], ","), StepTimeout: 10 * time.Second, RollbackAttempts: 1}
			for _, kv := range f[2:] {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "attempts":
					cfg.RollbackAttempts, _ = strconv.Atoi(v)
				case "backoff", "backoffmax", "retryfor":
					d, err := time.ParseDuration(v)
					if err != nil {
						t.Fatalf("%s: %s: %v", path, kv, err)
					}
					*map[string]*time.Duration{"backoff": &cfg.RetryBackoff, "backoffmax": &cfg.RetryBackoffMax, "retryfor": &cfg.RetryFor}[k] = d
				case "budget":
					d, err := time.ParseDuration(v)
					if err != nil {
						t.Fatalf("%s: %s: %v", path, kv, err)
					}
					cfg.LateBudget = d
				case "hooks":
					cfg.Hooks = strings.Split(v, ",")
				case "marks":
					for _, m := range strings.Split(v, ",") {
						p := strings.Split(m, "/")
						if len(p) != 3 {
							t.Fatalf("%s: mark %q: want hook/point/state", path, m)
						}
						cfg.HookMarks = append(cfg.HookMarks, HookMark{Hook: p[0], Point: HookPoint(p[1]), State: HookState(p[2])})
					}
				case "verifier":
					cfg.Verifier = true
				case "wait":
					cfg.LateWait = true
				case "probes":
					cfg.Probes = true
				case "batches": // n1/n2,n3: batch 1 is n1, batch 2 n2 and n3
					for _, b := range strings.Split(v, "/") {
						cfg.Batches = append(cfg.Batches, strings.Split(b, ","))
					}
				default:
					t.Fatalf("%s: unknown option %q", path, kv)
				}
			}
			op = New(cfg)
			got = append(got, op.String())
		case "start":
			emit(op.Start())
		case "resume":
			r := map[string]Resume{"abort": ResumeAbort, "verify": ResumeVerify, "rollback": ResumeRollback, "finalize": ResumeFinalize}[f[1]]
			emit(op.ResumeAt(r))
		case "ok", "fail", "timeout":
			s, a := parseStep(t, f[2])
			rest := f[3:]
			var lateness time.Duration
			if f[0] == "ok" && len(rest) == 1 && strings.HasPrefix(rest[0], "lateness=") {
				var err error
				if lateness, err = time.ParseDuration(strings.TrimPrefix(rest[0], "lateness=")); err != nil {
					t.Fatalf("%s: %s: %v", path, b.cmd, err)
				}
				rest = nil
			}
			var ev Event = Reply{Node: f[1], Step: s, Attempt: a, OK: f[0] == "ok", Err: strings.Join(rest, " "), Lateness: lateness}
			if f[0] == "timeout" {
				ev = Timeout{Node: f[1], Step: s, Attempt: a}
			}
			emit(op.Step(ev))
		case "late":
			a := 1
			if len(f) > 2 {
				_, a = parseStep(t, "commit"+f[2])
			}
			emit(op.Step(Late{Node: f[1], Attempt: a}))
		case "deadline":
			s, a := parseStep(t, f[1])
			emit(op.Step(Deadline{Step: s, Attempt: a}))
		case "journal-failed":
			s, a := parseStep(t, f[1])
			emit(op.Step(JournalFailed{Step: s, Attempt: a, Err: strings.Join(f[2:], " ")}))
		case "stepfail":
			emit(op.Step(StepFailed{Step: Step(f[1]), Reason: strings.Join(f[2:], " ")}))
		case "rollback":
			emit(op.Step(RollbackRequested{Reason: strings.Join(f[1:], " ")}))
		case "ended":
			out := map[string]Outcome{"succeeded": Succeeded, "aborted": Aborted, "rolled-back": RolledBack, "failed": Failed}[f[1]]
			op.Ended(out, strings.Join(f[2:], " "))
			got = append(got, strings.SplitN(op.String(), "\n", 2)[0])
		case "hook":
			emit(op.Step(HookDone{Hook: f[1], Point: HookPoint(f[2]), Err: strings.Join(f[3:], " ")}))
		case "verified":
			emit(op.Step(Verified{Err: strings.Join(f[1:], " ")}))
		case "probes-reset":
			emit(op.Step(ProbesReset{}))
		case "probes-read":
			emit(op.Step(ProbesRead{}))
		case "state":
			got = append(got, op.String())
		default:
			t.Fatalf("%s: unknown command %q", path, b.cmd)
		}
		g := strings.Join(got, "\n")
		if !*rewrite && g != b.want {
			t.Errorf("%s: %s\n got:\n%s\nwant:\n%s", path, b.cmd, g, b.want)
		}
		for _, c := range b.comments {
			out.WriteString(c + "\n")
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n", b.cmd, g)
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
