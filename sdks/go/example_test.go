package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	sandbox "github.com/koder-ai/koder-sandbox/sdks/go"
)

// Examples are compiled with the tests (they need a daemon, so they are not run).

func Example() {
	ctx := context.Background()
	c, err := sandbox.NewClient("http://127.0.0.1:7070", os.Getenv("KODER_KEY"))
	if err != nil {
		panic(err)
	}
	s, err := c.CreateSession(ctx, sandbox.CreateSessionRequest{Language: "python"})
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	r, err := c.Exec(ctx, s.ID, sandbox.ExecRequest{Code: "print(6 * 7)"})
	if err != nil {
		panic(err)
	}
	fmt.Print(r.Stdout)
}

func ExampleClient_StreamExec() {
	ctx := context.Background()
	c, _ := sandbox.NewClient("http://127.0.0.1:7070", os.Getenv("KODER_KEY"))
	st, err := c.StreamExec(ctx, "session-id", sandbox.ExecRequest{Shell: "echo a; echo b >&2"})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	for st.Next() {
		ev := st.Event()
		switch ev.Type {
		case sandbox.EventStdout:
			os.Stdout.Write(ev.Data)
		case sandbox.EventStderr:
			os.Stderr.Write(ev.Data)
		case sandbox.EventExit:
			fmt.Println("verdict:", ev.Result.Verdict)
		}
	}
	if err := st.Err(); err != nil {
		panic(err)
	}
}

func ExampleSandboxError() {
	ctx := context.Background()
	c, _ := sandbox.NewClient("http://127.0.0.1:7070", os.Getenv("KODER_KEY"))
	_, err := c.GetSession(ctx, "someone-elses-session")
	var se *sandbox.SandboxError
	if errors.As(err, &se) && se.Code == sandbox.CodeNotFound {
		fmt.Println("no such session (HTTP", se.Status, ")")
	}
}

func ExampleClient_RunCode() {
	ctx := context.Background()
	c, _ := sandbox.NewClient("http://127.0.0.1:7070", os.Getenv("KODER_KEY"))
	r, err := c.RunCode(ctx, "session-id", sandbox.DefaultContext, sandbox.RunCodeRequest{
		Code: "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()\nsum([1, 2, 3])",
	})
	if err != nil {
		panic(err)
	}
	if r.Error != nil {
		fmt.Println(r.Error.Name, r.Error.Value)
	}
	for _, out := range r.Results {
		if len(out.Chart) > 0 {
			fmt.Println("chart:", string(out.Chart))
		}
	}
	if m := r.Main(); m != nil {
		fmt.Println("value:", m.Text)
	}
}
