mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke() {
    let Some(()) = root_or_skip() else { return };
    let env = runtime("smoke");
    let sb = sandbox(&env).await;
    let out = run(
        &sb,
        "id; echo hi; /usr/bin/python3 -c 'print(1+1)'; pwd; ls /",
    )
    .await;
    eprintln!(
        "{}\n{}\n{:?}",
        text(&out.stdout),
        text(&out.stderr),
        out.exit
    );
    sb.destroy().await.unwrap();
}
