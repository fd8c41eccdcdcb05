//! The shape check a module passes before anything of it is compiled.
//!
//! [`check`] walks the module's sections with wasmparser (no validation of function bodies,
//! no code generation) and measures what makes a compile expensive: how many functions it
//! defines, how big the largest body and the whole code section are, how many locals a
//! function declares, and the sizes of the other index spaces and segments. The first value
//! over its [`ModuleLimits`] entry (or over the instance limits a declared memory or table
//! minimum must fit) is refused with [`LoadError::ModuleLimit`].
//!
//! Cost: the walk reads each section header and each function's locals declarations, nothing
//! more; counts are checked as soon as a section announces them, so a module of a million
//! functions is refused at its function section without looking at a single body.
//! [`ModuleShape::of`] measures a module without limits (tests, `narad plugin test`).

use wasmparser::{ElementItems, Imports, Parser, Payload, TypeRef};

use crate::error::{LoadError, ModuleLimit};
use crate::limits::{Limits, MAX_MEMORIES, MAX_TABLES, ModuleLimits};

/// What the shape check measured of a module.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleShape {
    /// Functions the module defines (its code section's entries).
    pub functions: u64,
    /// Size of the largest function body in bytes (locals declarations included).
    pub max_function_body_bytes: u64,
    /// Size of the code section in bytes.
    pub code_bytes: u64,
    /// Most locals one function declares (parameters not counted).
    pub max_locals_per_function: u64,
    /// Entries of the type section.
    pub types: u64,
    /// Imports.
    pub imports: u64,
    /// Exports.
    pub exports: u64,
    /// Defined globals.
    pub globals: u64,
    /// Data segments.
    pub data_segments: u64,
    /// Bytes of all data segments together.
    pub data_bytes: u64,
    /// Element segments.
    pub element_segments: u64,
    /// Items of all element segments together.
    pub element_items: u64,
    /// Memories declared or imported.
    pub memories: u64,
    /// Tables declared or imported.
    pub tables: u64,
    /// Largest declared minimum memory size in bytes.
    pub max_memory_minimum_bytes: u64,
    /// Largest declared minimum table size in elements.
    pub max_table_minimum_elements: u64,
}

impl ModuleShape {
    /// Measures `bytes` without refusing anything for its size; a malformed module is
    /// [`LoadError::Compile`].
    pub fn of(bytes: &[u8]) -> Result<ModuleShape, LoadError> {
        walk(bytes, &Bounds::UNLIMITED)
    }
}

/// Refuses `bytes` when its shape is over `limits` (the module limits, and the instance
/// memory and table limits for declared minimums). Malformed sections are
/// [`LoadError::Compile`], as the compiler would report them.
pub fn check(limits: &Limits, bytes: &[u8]) -> Result<ModuleShape, LoadError> {
    walk(bytes, &Bounds::from_limits(limits))
}

/// Every maximum the walk compares against, widened to `u64`.
struct Bounds {
    functions: u64,
    function_body_bytes: u64,
    code_bytes: u64,
    locals_per_function: u64,
    items: u64,
    data_bytes: u64,
    memories: u64,
    tables: u64,
    memory_minimum_bytes: u64,
    table_minimum_elements: u64,
}

impl Bounds {
    const UNLIMITED: Bounds = Bounds {
        functions: u64::MAX,
        function_body_bytes: u64::MAX,
        code_bytes: u64::MAX,
        locals_per_function: u64::MAX,
        items: u64::MAX,
        data_bytes: u64::MAX,
        memories: u64::MAX,
        tables: u64::MAX,
        memory_minimum_bytes: u64::MAX,
        table_minimum_elements: u64::MAX,
    };

    fn from_limits(limits: &Limits) -> Bounds {
        let module: &ModuleLimits = &limits.module;
        Bounds {
            functions: u64::from(module.max_functions),
            function_body_bytes: u64::from(module.max_function_body_bytes),
            code_bytes: module.max_code_bytes,
            locals_per_function: u64::from(module.max_locals_per_function),
            items: u64::from(module.max_items),
            data_bytes: module.max_data_bytes,
            memories: MAX_MEMORIES as u64,
            tables: MAX_TABLES as u64,
            memory_minimum_bytes: limits.memory_bytes,
            table_minimum_elements: limits.table_elements as u64,
        }
    }
}

/// Refuses `found` when it is over `max`.
fn within(
    limit: ModuleLimit,
    found: u64,
    max: u64,
    function: Option<u32>,
) -> Result<(), LoadError> {
    if found > max {
        return Err(LoadError::ModuleLimit {
            limit,
            found,
            max,
            function,
        });
    }
    Ok(())
}

fn malformed(error: wasmparser::BinaryReaderError) -> LoadError {
    LoadError::Compile {
        message: error.to_string(),
    }
}

fn walk(bytes: &[u8], max: &Bounds) -> Result<ModuleShape, LoadError> {
    let mut shape = ModuleShape::default();
    let mut function_index: u32 = 0;
    let memory = |shape: &mut ModuleShape, ty: &wasmparser::MemoryType| {
        shape.memories += 1;
        within(ModuleLimit::Memories, shape.memories, max.memories, None)?;
        let page_bytes_log2 = ty.page_size_log2.unwrap_or(16).min(63);
        let minimum = ty.initial.saturating_mul(1u64 << page_bytes_log2);
        shape.max_memory_minimum_bytes = shape.max_memory_minimum_bytes.max(minimum);
        within(
            ModuleLimit::MemoryMinimumBytes,
            minimum,
            max.memory_minimum_bytes,
            None,
        )
    };
    let table = |shape: &mut ModuleShape, ty: &wasmparser::TableType| {
        shape.tables += 1;
        within(ModuleLimit::Tables, shape.tables, max.tables, None)?;
        shape.max_table_minimum_elements = shape.max_table_minimum_elements.max(ty.initial);
        within(
            ModuleLimit::TableMinimumElements,
            ty.initial,
            max.table_minimum_elements,
            None,
        )
    };
    let import = |shape: &mut ModuleShape, ty: &TypeRef| -> Result<(), LoadError> {
        shape.imports += 1;
        within(ModuleLimit::Imports, shape.imports, max.items, None)?;
        match ty {
            TypeRef::Memory(m) => memory(shape, m),
            TypeRef::Table(t) => table(shape, t),
            _ => Ok(()),
        }
    };
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(malformed)? {
            Payload::TypeSection(reader) => {
                shape.types = u64::from(reader.count());
                within(ModuleLimit::Types, shape.types, max.items, None)?;
            }
            Payload::ImportSection(reader) => {
                for group in reader {
                    match group.map_err(malformed)? {
                        Imports::Single(_, one) => import(&mut shape, &one.ty)?,
                        Imports::Compact1 { items, .. } => {
                            for item in items {
                                import(&mut shape, &item.map_err(malformed)?.ty)?;
                            }
                        }
                        Imports::Compact2 { ty, names, .. } => {
                            for name in names {
                                name.map_err(malformed)?;
                                import(&mut shape, &ty)?;
                            }
                        }
                    }
                }
            }
            Payload::FunctionSection(reader) => {
                shape.functions = u64::from(reader.count());
                within(ModuleLimit::Functions, shape.functions, max.functions, None)?;
            }
            Payload::TableSection(reader) => {
                for entry in reader {
                    table(&mut shape, &entry.map_err(malformed)?.ty)?;
                }
            }
            Payload::MemorySection(reader) => {
                for entry in reader {
                    memory(&mut shape, &entry.map_err(malformed)?)?;
                }
            }
            Payload::GlobalSection(reader) => {
                shape.globals = u64::from(reader.count());
                within(ModuleLimit::Globals, shape.globals, max.items, None)?;
            }
            Payload::ExportSection(reader) => {
                shape.exports = u64::from(reader.count());
                within(ModuleLimit::Exports, shape.exports, max.items, None)?;
            }
            Payload::ElementSection(reader) => {
                shape.element_segments = u64::from(reader.count());
                within(
                    ModuleLimit::ElementSegments,
                    shape.element_segments,
                    max.items,
                    None,
                )?;
                for element in reader {
                    let items = match element.map_err(malformed)?.items {
                        ElementItems::Functions(items) => items.count(),
                        ElementItems::Expressions(_, items) => items.count(),
                    };
                    shape.element_items = shape.element_items.saturating_add(u64::from(items));
                    within(
                        ModuleLimit::ElementItems,
                        shape.element_items,
                        max.items,
                        None,
                    )?;
                }
            }
            Payload::DataSection(reader) => {
                shape.data_segments = u64::from(reader.count());
                within(
                    ModuleLimit::DataSegments,
                    shape.data_segments,
                    max.items,
                    None,
                )?;
                for segment in reader {
                    let len = segment.map_err(malformed)?.data.len() as u64;
                    shape.data_bytes = shape.data_bytes.saturating_add(len);
                    within(
                        ModuleLimit::DataBytes,
                        shape.data_bytes,
                        max.data_bytes,
                        None,
                    )?;
                }
            }
            Payload::CodeSectionStart { count, size, .. } => {
                // Checked here, before any body is read: the function section may be absent
                // or disagree (the compiler refuses that), so the code section's own count
                // counts too.
                shape.functions = shape.functions.max(u64::from(count));
                within(ModuleLimit::Functions, shape.functions, max.functions, None)?;
                shape.code_bytes = u64::from(size);
                within(
                    ModuleLimit::CodeBytes,
                    shape.code_bytes,
                    max.code_bytes,
                    None,
                )?;
            }
            Payload::CodeSectionEntry(body) => {
                let index = function_index;
                function_index = function_index.saturating_add(1);
                let body_bytes = body.range().len() as u64;
                shape.max_function_body_bytes = shape.max_function_body_bytes.max(body_bytes);
                within(
                    ModuleLimit::FunctionBodyBytes,
                    body_bytes,
                    max.function_body_bytes,
                    Some(index),
                )?;
                let mut locals: u64 = 0;
                for declaration in body.get_locals_reader().map_err(malformed)? {
                    let (count, _) = declaration.map_err(malformed)?;
                    locals = locals.saturating_add(u64::from(count));
                    within(
                        ModuleLimit::LocalsPerFunction,
                        locals,
                        max.locals_per_function,
                        Some(index),
                    )?;
                }
                shape.max_locals_per_function = shape.max_locals_per_function.max(locals);
            }
            _ => {}
        }
    }
    Ok(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_plugins_fit_the_default_limits_with_a_wide_margin() {
        let limits = Limits::default();
        for (name, bytes) in narad_builtin_plugins::all() {
            let shape = check(&limits, bytes).unwrap();
            eprintln!("{name}: {} bytes, {shape:?}", bytes.len());
            let module = &limits.module;
            assert!(
                shape.functions * 10 <= u64::from(module.max_functions),
                "{name}"
            );
            assert!(
                shape.max_function_body_bytes * 10 <= u64::from(module.max_function_body_bytes),
                "{name}"
            );
            assert!(shape.code_bytes * 10 <= module.max_code_bytes, "{name}");
            assert!(
                shape.max_locals_per_function * 10 <= u64::from(module.max_locals_per_function),
                "{name}"
            );
            assert!(shape.data_bytes * 10 <= module.max_data_bytes, "{name}");
        }
    }
}
