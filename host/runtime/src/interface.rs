//! The module's interface, checked before anything of it is compiled: its imports (only the
//! log call, with its signature) and its exports (memory and the ABI functions, with theirs).
//!
//! A module that imports something else, or lacks an export, can never load; finding that
//! out after compiling it cost a full compile (seconds for a module at the limits) per
//! attempt. [`check`] reads the type, import, function, memory and export sections with
//! wasmparser; it is the one place these rules live. Sections are read as they come; nothing
//! here validates code (the compile does, after).

use wasmparser::{ExternalKind, FuncType, Imports, Parser, Payload, TypeRef, ValType};

use crate::error::LoadError;
use narad_abi::symbols;

/// Checks the imports and exports of `bytes` (see the module doc).
pub(crate) fn check(bytes: &[u8]) -> Result<(), LoadError> {
    let mut types: Vec<FuncType> = Vec::new();
    // The type of each function, by function index: imported ones first, as Wasm numbers them.
    let mut functions: Vec<u32> = Vec::new();
    let mut memories: Vec<wasmparser::MemoryType> = Vec::new();
    let mut exports: Vec<(String, ExternalKind, u32)> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(malformed)? {
            Payload::TypeSection(reader) => {
                for ty in reader.into_iter_err_on_gc_types() {
                    types.push(ty.map_err(malformed)?);
                }
            }
            Payload::ImportSection(reader) => {
                for group in reader {
                    match group.map_err(malformed)? {
                        Imports::Single(_, one) => {
                            import(&types, &mut functions, one.module, one.name, &one.ty)?;
                        }
                        Imports::Compact1 { module, items } => {
                            for item in items {
                                let item = item.map_err(malformed)?;
                                import(&types, &mut functions, module, item.name, &item.ty)?;
                            }
                        }
                        Imports::Compact2 { module, ty, names } => {
                            for name in names {
                                import(
                                    &types,
                                    &mut functions,
                                    module,
                                    name.map_err(malformed)?,
                                    &ty,
                                )?;
                            }
                        }
                    }
                }
            }
            Payload::FunctionSection(reader) => {
                for ty in reader {
                    functions.push(ty.map_err(malformed)?);
                }
            }
            Payload::MemorySection(reader) => {
                for memory in reader {
                    memories.push(memory.map_err(malformed)?);
                }
            }
            Payload::ExportSection(reader) => {
                for export in reader {
                    let export = export.map_err(malformed)?;
                    exports.push((export.name.to_owned(), export.kind, export.index));
                }
            }
            _ => {}
        }
    }
    let find = |name: &str| {
        exports
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, kind, index)| (*kind, *index))
    };
    for name in symbols::REQUIRED_EXPORTS {
        if find(name).is_none() {
            return Err(LoadError::MissingExport { name });
        }
    }
    match find(symbols::MEMORY) {
        Some((ExternalKind::Memory, index)) => {
            // An imported memory is refused with the imports; a defined one is checked here.
            if let Some(memory) = memories.get(index as usize)
                && (memory.memory64 || memory.shared)
            {
                return Err(LoadError::WrongExportType {
                    name: symbols::MEMORY,
                    expected: "memory (32-bit, not shared)",
                    found: format!(
                        "memory ({}{})",
                        if memory.memory64 { "64-bit" } else { "32-bit" },
                        if memory.shared { ", shared" } else { "" }
                    ),
                });
            }
        }
        Some((kind, _)) => {
            return Err(LoadError::WrongExportType {
                name: symbols::MEMORY,
                expected: "memory (32-bit, not shared)",
                found: kind_name(kind).to_owned(),
            });
        }
        None => {
            return Err(LoadError::MissingExport {
                name: symbols::MEMORY,
            });
        }
    }
    for (name, params, results, expected) in FUNCTION_EXPORTS {
        let Some((kind, index)) = find(name) else {
            return Err(LoadError::MissingExport { name });
        };
        let ty = (kind == ExternalKind::Func)
            .then(|| functions.get(index as usize))
            .flatten()
            .and_then(|t| types.get(*t as usize));
        let ok = ty.is_some_and(|ty| {
            ty.params().len() == params.len()
                && ty
                    .params()
                    .iter()
                    .zip(params)
                    .all(|(p, want)| want.matches(p))
                && ty.results().len() == results.len()
                && ty
                    .results()
                    .iter()
                    .zip(results)
                    .all(|(r, want)| want.matches(r))
        });
        if !ok {
            return Err(LoadError::WrongExportType {
                name,
                expected,
                found: ty.map_or_else(|| kind_name(kind).to_owned(), describe),
            });
        }
    }
    Ok(())
}

/// The signature each required function export must have: (name, params, results, text).
const FUNCTION_EXPORTS: [(&str, &[Ty], &[Ty], &str); 5] = [
    (symbols::ABI_VERSION, &[], &[Ty::I32], "func () -> i32"),
    (symbols::ALLOC, &[Ty::I32], &[Ty::I32], "func (i32) -> i32"),
    (
        symbols::DEALLOC,
        &[Ty::I32, Ty::I32],
        &[],
        "func (i32, i32)",
    ),
    (
        symbols::ROUTE,
        &[Ty::I32, Ty::I32, Ty::I32],
        &[Ty::I32],
        "func (i32, i32, i32) -> i32",
    ),
    (symbols::LAST_ERROR, &[], &[Ty::I64], "func () -> i64"),
];

/// A value type the ABI's signatures use.
#[derive(Clone, Copy)]
enum Ty {
    I32,
    I64,
}

impl Ty {
    fn matches(self, ty: &ValType) -> bool {
        match self {
            Ty::I32 => *ty == ValType::I32,
            Ty::I64 => *ty == ValType::I64,
        }
    }
}

/// Checks one import: only the log call, with its signature.
fn import(
    types: &[FuncType],
    functions: &mut Vec<u32>,
    module: &str,
    name: &str,
    ty: &TypeRef,
) -> Result<(), LoadError> {
    if module != symbols::IMPORT_MODULE || name != symbols::IMPORT_LOG {
        return Err(LoadError::ForbiddenImport {
            module: module.to_owned(),
            name: name.to_owned(),
        });
    }
    let signature = match ty {
        TypeRef::Func(index) | TypeRef::FuncExact(index) => {
            functions.push(*index);
            types.get(*index as usize)
        }
        _ => None,
    };
    let ok = signature.is_some_and(|f| {
        f.params().len() == 3
            && f.params().iter().all(|p| *p == ValType::I32)
            && f.results().is_empty()
    });
    if !ok {
        return Err(LoadError::WrongImportType {
            expected: "func (i32, i32, i32)",
            found: signature.map_or_else(|| type_ref_name(ty).to_owned(), describe),
        });
    }
    Ok(())
}

/// A function type as the errors show it: `func (i32, i32) -> i64`.
fn describe(ty: &FuncType) -> String {
    let list = |types: &[ValType]| types.iter().map(val_name).collect::<Vec<_>>().join(", ");
    if ty.results().is_empty() {
        format!("func ({})", list(ty.params()))
    } else {
        format!("func ({}) -> {}", list(ty.params()), list(ty.results()))
    }
}

fn val_name(ty: &ValType) -> &'static str {
    match ty {
        ValType::I32 => "i32",
        ValType::I64 => "i64",
        ValType::F32 => "f32",
        ValType::F64 => "f64",
        ValType::V128 => "v128",
        ValType::Ref(_) => "ref",
    }
}

fn kind_name(kind: ExternalKind) -> &'static str {
    match kind {
        ExternalKind::Func | ExternalKind::FuncExact => "func",
        ExternalKind::Table => "table",
        ExternalKind::Memory => "memory",
        ExternalKind::Global => "global",
        ExternalKind::Tag => "tag",
    }
}

fn type_ref_name(ty: &TypeRef) -> &'static str {
    match ty {
        TypeRef::Func(_) | TypeRef::FuncExact(_) => "func",
        TypeRef::Table(_) => "table",
        TypeRef::Memory(_) => "memory",
        TypeRef::Global(_) => "global",
        TypeRef::Tag(_) => "tag",
    }
}

fn malformed(error: wasmparser::BinaryReaderError) -> LoadError {
    LoadError::Compile {
        message: error.to_string(),
    }
}
