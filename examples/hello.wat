;; The WebAssembly task of `dagcron serve --demo`: a WASI preview 1 command
;; that prints a line and exits 0. It sees no file, no network and no
;; variable of the server: only what its task grants. Written as text so
;; that no toolchain is needed; `wasm-tools parse hello.wat -o hello.wasm`
;; makes the binary form, which runs the same.
(module
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "hello from a WebAssembly sandbox\n")
  (func (export "_start")
    ;; One iovec at 0: the text at 64, 33 bytes long.
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 33))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
